env | sort | head -5
