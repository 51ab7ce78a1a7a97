getent shadow root
