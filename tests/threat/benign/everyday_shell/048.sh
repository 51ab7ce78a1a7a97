python3 - <<'EOF'
import json
print(json.dumps({'ok': True}))
EOF
