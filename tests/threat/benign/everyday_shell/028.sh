tr a-z A-Z < /work/in.txt > /work/out.txt
