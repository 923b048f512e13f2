"""Desired state: spec files and markers, loaded, validated and typed.

Safe YAML with positions (``yamlsafe``, ``yamlevents``), JSON Schema validation with
file:line:field problems (``validate``), the directory loader with its cache
(``loader``, ``filecache``), markers (``markerfiles``), secret references and the log
scrubber (``secrets``), permissions (``permissions``) and time parsing (``timeparse``).

May import: the ground (``model``, ``errors``, ``settings``) only.
"""
