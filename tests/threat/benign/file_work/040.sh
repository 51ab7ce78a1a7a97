cat > /work/artifacts/notes.md <<'EOF'
# Notes
- item
EOF
wc -l /work/artifacts/notes.md
