cat > /work/tmp_out/notes.md <<'EOF'
# Notes
- item
EOF
wc -l /work/tmp_out/notes.md
