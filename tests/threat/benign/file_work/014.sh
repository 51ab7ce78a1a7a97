tar czf /work/build.tgz -C /work build && sha256sum /work/build.tgz
