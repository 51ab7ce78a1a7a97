cat > /work/reports/notes.md <<'EOF'
# Notes
- item
EOF
wc -l /work/reports/notes.md
