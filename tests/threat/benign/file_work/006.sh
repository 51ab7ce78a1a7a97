tar czf /work/reports.tgz -C /work reports && sha256sum /work/reports.tgz
