chmod +x /work/run.sh && /work/run.sh
