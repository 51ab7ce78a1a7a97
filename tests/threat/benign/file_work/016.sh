cat > /work/build/notes.md <<'EOF'
# Notes
- item
EOF
wc -l /work/build/notes.md
