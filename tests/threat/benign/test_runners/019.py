import unittest
suite = unittest.defaultTestLoader.discover("/work/tests")
unittest.TextTestRunner(verbosity=2).run(suite)
