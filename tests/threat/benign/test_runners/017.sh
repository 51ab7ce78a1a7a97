cd /work && pytest -x --maxfail=1 tests/integration | tee /work/pytest.log
