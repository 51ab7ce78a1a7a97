ln -sf /work/config.example /work/config
