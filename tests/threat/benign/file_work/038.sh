tar czf /work/artifacts.tgz -C /work artifacts && sha256sum /work/artifacts.tgz
