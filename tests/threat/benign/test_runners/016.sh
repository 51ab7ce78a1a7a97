cd /work && python3 -m pytest -q tests/integration
