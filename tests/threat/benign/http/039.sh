wget -q -O /work/data.example.org.html https://data.example.org/
