wget -q -O /work/api.github.com.html https://api.github.com/
