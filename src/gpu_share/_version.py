__version__ = "0.4.0"
API_VERSION = "0.4.0"
