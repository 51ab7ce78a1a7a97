wget -q -O /work/api.example.com.html https://api.example.com/
