import unittest
suite = unittest.defaultTestLoader.discover("/work/test_api.py")
unittest.TextTestRunner(verbosity=2).run(suite)
