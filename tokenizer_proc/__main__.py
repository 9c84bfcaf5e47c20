"""python -m tessera.tokenizer_proc --run-dir DIR [--index I]"""

import sys

from tessera.tokenizer_proc.process import main

if __name__ == "__main__":
    sys.exit(main())
