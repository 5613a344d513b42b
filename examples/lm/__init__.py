"""A small decoder-only transformer language model trained with devplug on the bytes of Python's own standard library.

``python examples/lm.py`` runs it (``train.py``); ``corpus.py`` builds the text, ``models.py`` the network,
``cli.py`` the flags, ``summary.py`` the report at the end.
"""
