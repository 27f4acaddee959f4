-- The one way a rule refuses: fabric._raise_rule raises the rule's SQLSTATE with a message
-- that names the rule and a hint at the fix. Every other function raises through it, so an
-- error's shape (SQLSTATE, message, hint, optional detail) is decided in one place and a
-- client value never travels in it by accident: callers pass fixed texts or identifiers the
-- rule itself defines, never content.

-- ---------------------------------------------------------------------------------------
-- fabric._raise_rule: raise p_errcode (a condition name such as 'invalid_parameter_value'
-- or a five-character SQLSTATE such as 'MF004') with the rule's message and hint.
CREATE OR REPLACE FUNCTION fabric._raise_rule(p_errcode text, p_message text,
                                              p_hint text DEFAULT NULL,
                                              p_detail text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- A RAISE option cannot be NULL, and an empty one would still be sent: one branch each.
  IF p_hint IS NULL AND p_detail IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message;
  ELSIF p_detail IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, HINT = p_hint;
  ELSIF p_hint IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, DETAIL = p_detail;
  ELSE
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, HINT = p_hint,
      DETAIL = p_detail;
  END IF;
END $$;
