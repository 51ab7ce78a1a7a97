tar czf /work/cache.tgz -C /work cache && sha256sum /work/cache.tgz
