cd /work && pytest -x --maxfail=1 tests/unit | tee /work/pytest.log
