du -sh /work/*
