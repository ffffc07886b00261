"""The Python side of the C engine (``pytest_memlab._engine``): choosing
the backend and loading the torch bridge, the tracer's scope, meters over
the engine's scopes, and reading attribution back.  The modules of this
package are the only ones that import ``_engine``."""
