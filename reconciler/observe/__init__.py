"""What an operator sees: ``status`` (one document per supervisor, from the store and
the brokers), the status page (server-rendered HTML), Prometheus metrics with the
HTTP handler that serves them (``httpserver``: bounded threads and connections), and
``render`` (tables and text for terminals, control characters escaped).

May import: ``store``, ``streams``, ``spec`` and the ground. Imported by ``daemon``
(metrics, the page) and ``cli``; never by the control plane or the runtimes.
"""
