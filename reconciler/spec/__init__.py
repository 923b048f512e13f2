"""Desired state: spec files and markers, loaded, validated and typed.

Safe YAML with positions (``yamlsafe``, ``yamlevents``), JSON Schema validation with
file:line:field problems (``validate``) and the rules the schema cannot say (``columns``,
``uris``, ``references``), the directory loader (``loader``: ``names``, ``specfiles`` with
its cache ``filecache``, ``markers``; ``crossfile`` compares files), retiring markers
(``markerfiles``), secret references (``secrets``) granted by the operator (``grants``) and
the log scrubber (``scrubber``), permissions (``permissions``) and time parsing (``timeparse``).

May import: the ground (``model``, ``errors``, ``settings``) only.
"""
