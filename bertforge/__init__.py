"""bertforge: the one import name this project installs.

The product's folders sit at the top of the repository, where users know them, and install
under this name (pyproject.toml's ``package-dir``): ``kernels/`` -> ``bertforge.kernels``,
``data_prep/`` -> ``bertforge.data_prep``, ``pretrain/`` -> ``bertforge.pretrain``; this folder
holds the shared core (errors, files, logs, cli). ``kernels/`` has no ``__init__.py`` on purpose:
with the repository root on ``sys.path`` (``python -m ...`` or pytest run there) a package named
``kernels`` would shadow Hugging Face's ``kernels``, which transformers imports.
"""

from pathlib import Path

# In a source checkout (an editable install, or the repository itself on sys.path) the names
# above resolve to the same top-level folders as in an installed wheel. setuptools' editable
# finder cannot map a folder without __init__.py (kernels/), so the package path takes in the
# repository root; an installed wheel has the folders inside this package and skips this.
_REPOSITORY = Path(__file__).resolve().parent.parent
if (_REPOSITORY / "pyproject.toml").is_file() and (_REPOSITORY / "kernels" / "api.py").is_file():
    __path__.append(str(_REPOSITORY))
