"""The processes the project starts and stops: tritonserver (``triton_launcher``), the sidecar as a subprocess
(``sidecar``) and the guard that takes a child down with its parent (``die_with_parent``). Below every package
that starts one: it imports only the error tree and the python backend's names."""
