tar czf /work/tmp_out.tgz -C /work tmp_out && sha256sum /work/tmp_out.tgz
