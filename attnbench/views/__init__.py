"""Views over the results store: tables and plots, the report page, compare and show."""
