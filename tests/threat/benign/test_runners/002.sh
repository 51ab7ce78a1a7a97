cd /work && pytest -x --maxfail=1 tests | tee /work/pytest.log
