"""``python -m trioha.pipeline COMMAND ...``, and the file to give ``spark-submit``.

On a cluster::

    spark-submit --master yarn [--py-files trioha.zip] \\
        "$(python -c 'import trioha.pipeline as p; print(p.SUBMIT_FILE)')" audit /data/a /data/b
"""

import sys

from trioha._logging import configure_logging
from trioha.pipeline._cli import main

if __name__ == "__main__":
    configure_logging()  # progress lines off a terminal are log lines
    sys.exit(main())
