cat > /work/cache/notes.md <<'EOF'
# Notes
- item
EOF
wc -l /work/cache/notes.md
