import sys

from mixrt.kvstore.dist import main

sys.exit(main())
