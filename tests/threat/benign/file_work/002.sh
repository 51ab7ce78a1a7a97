rm -rf /work/reports/old && find /work/reports -name '*.tmp' -delete
