mod file_store;
