#!/bin/sh
# Writes the corpus of the embedded n-gram model to stdout: the King James
# Version from Debian's bible-kjv-text (read with its bible-kjv program), one
# verse per line, with the verse reference ("Ge1:1 ") stripped.
#   apt-get install -y bible-kjv-text    # pulls in bible-kjv
#   sh scripts/ngram/kjv_corpus.sh > /tmp/kjv.txt   # 4,137,850 bytes, 31,102 lines
set -eu
bible -f gen1:1-rev22:21 </dev/null | sed -E 's/^[1-3]?[A-Za-z]+[0-9]+:[0-9]+ //'
