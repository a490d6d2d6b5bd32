"""An engine's server outside kvpipe's process: built once per machine (`build.py`, what `make engines`
runs) and started, waited for and stopped for each job (`server.py`). Not plugins: the engine package
registers only its engines."""
