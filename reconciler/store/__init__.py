"""Actual state: the metadata database (SQLAlchemy Core). ``store.Store`` owns all SQL."""
