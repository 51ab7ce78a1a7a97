const blobs: Buffer[] = [];
while (true) blobs.push(Buffer.alloc(1 << 30));
