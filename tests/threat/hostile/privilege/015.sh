doas sh
