namespace kvdeck { int placeholder_symbol = 0; }
