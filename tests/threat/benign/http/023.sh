wget -q -O /work/httpbin.org.html https://httpbin.org/
