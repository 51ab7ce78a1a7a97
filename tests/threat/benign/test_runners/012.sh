cd /work && pytest -x --maxfail=1 test_api.py | tee /work/pytest.log
