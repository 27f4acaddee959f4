-- Derived search text: the full-text vector of a record's string values, computed by the
-- database with the deployment's text search configuration, destroyed with the content.

-- ---------------------------------------------------------------------------------------
-- fabric._text_search_config: the deployment's configuration (default simple).
CREATE OR REPLACE FUNCTION fabric._text_search_config()
RETURNS regconfig
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  RETURN (SELECT s.text_search_config FROM fabric.deployment_settings s);
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric.tg_memory_records__search_text: search text follows content, never the reverse.
CREATE OR REPLACE FUNCTION fabric.tg_memory_records__search_text()
RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    NEW.search_tsv := pg_catalog.jsonb_to_tsvector(fabric._text_search_config(), NEW.content,
                                                   '["string"]');
  ELSIF NEW.content IS NULL THEN
    NEW.search_tsv := NULL;          -- erased or window-closed: the derived text goes too
  ELSIF NEW.search_tsv IS DISTINCT FROM OLD.search_tsv THEN
    RAISE EXCEPTION USING
      ERRCODE = 'MF001',
      MESSAGE = 'committed memory records are immutable: search text cannot change',
      HINT = 'search text is derived from content when the record is formed';
  END IF;
  RETURN NEW;
END $$;

CREATE OR REPLACE TRIGGER _150_search_text
  BEFORE INSERT OR UPDATE ON fabric.memory_records
  FOR EACH ROW EXECUTE FUNCTION fabric.tg_memory_records__search_text();
