"""One module per CLI command, plus the options and output rules they share. No Textual here."""
