"""The subcommands: one module each (`kvpipe NAME`), holding its arguments and its rendering."""
