"""python -m tessera.detokenizer_proc --run-dir DIR"""

import sys

from tessera.bus.process import process_main
from tessera.detokenizer_proc.process import Detokenizer

if __name__ == "__main__":
    sys.exit(process_main(Detokenizer))
