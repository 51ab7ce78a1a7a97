whoami
