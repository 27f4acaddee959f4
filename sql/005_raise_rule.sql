-- The one way a rule refuses: fabric._raise_rule raises the rule's SQLSTATE with a message
-- that names the rule and a hint at the fix, and for a rule that has a name of its own (a
-- check the database makes beyond its table constraints) that name as the error's
-- constraint. Every rule refusal in sql/ and rls/ raises through it, so an error's shape
-- (SQLSTATE, message, hint, optional detail and constraint) is decided in one place and a
-- client value never travels in it by accident: callers pass fixed texts or identifiers the
-- rule itself defines, never content.
--
-- Two RAISEs are not refusals through it, on purpose:
-- * fabric.tg_ddl__migration_role_only (sql/270) raises its own 42501. It is an event
--   trigger, so it runs as whoever ran the DDL, who may hold no EXECUTE on this function
--   (fabric_maintainer's MAINTAIN allows REINDEX, which fires it): through this function
--   the refusal would become "permission denied for function _raise_rule".
-- * fabric._ident (sql/010) raises a bare check_violation that its own block catches and
--   turns into the 22023 refusal raised here; no caller ever sees it.
-- A re-raise (`RAISE;`) passes on an error some statement raised, unchanged.

-- ---------------------------------------------------------------------------------------
-- fabric._raise_rule: raise p_errcode (a condition name such as 'invalid_parameter_value'
-- or a five-character SQLSTATE such as 'MF004') with the rule's message and hint, and
-- p_constraint (named: p_constraint => 'memory_records_semantic_needs_episode') as the
-- error's constraint name. The older four-argument signature is dropped, so that a call
-- with four arguments or fewer is not ambiguous between the two.
DROP FUNCTION IF EXISTS fabric._raise_rule(text, text, text, text);
CREATE OR REPLACE FUNCTION fabric._raise_rule(p_errcode text, p_message text,
                                              p_hint text DEFAULT NULL,
                                              p_detail text DEFAULT NULL,
                                              p_constraint text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
  -- A RAISE option cannot be NULL, and an empty one would still be sent: one branch each.
  IF p_constraint IS NULL THEN
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
  ELSIF p_hint IS NULL AND p_detail IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, CONSTRAINT = p_constraint;
  ELSIF p_detail IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, HINT = p_hint,
      CONSTRAINT = p_constraint;
  ELSIF p_hint IS NULL THEN
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, DETAIL = p_detail,
      CONSTRAINT = p_constraint;
  ELSE
    RAISE EXCEPTION USING ERRCODE = p_errcode, MESSAGE = p_message, HINT = p_hint,
      DETAIL = p_detail, CONSTRAINT = p_constraint;
  END IF;
END $$;
