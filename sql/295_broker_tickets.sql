-- Broker tickets: the login behind a connection to `memfabric serve`'s socket is the one
-- PostgreSQL authenticated, never one the client names. A client connected as its own login
-- takes a ticket (bound to session_user, short-lived, used once); serve redeems it on its own
-- connection and serves that socket connection as the ticket's login (the operational
-- stores' per-login collection allowlist). Only a ticket's hash is stored.

-- ---------------------------------------------------------------------------------------
-- fabric._broker_ticket_hash: what is stored of a ticket; NULL unless it has the issued form.
CREATE OR REPLACE FUNCTION fabric._broker_ticket_hash(p_ticket text)
RETURNS bytea
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
  SELECT fabric._secret_hash('mfb_', p_ticket)
$$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.issue_broker_ticket: a ticket naming the calling login (agents and domain
-- workflows), valid for p_ttl (at most an hour) and for one redemption.
CREATE OR REPLACE FUNCTION fabric_api.issue_broker_ticket(p_ttl interval DEFAULT '1 minute')
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_ticket text;
BEGIN
  PERFORM fabric._reset_context();
  IF p_ttl IS NULL OR p_ttl <= interval '0' OR p_ttl > interval '1 hour' THEN
    PERFORM fabric._raise_rule('invalid_parameter_value',
      'a broker ticket''s ttl must be positive and at most an hour',
      'the default (a minute) is enough: a ticket is redeemed once, when the socket connects');
  END IF;
  v_ticket := fabric._new_secret('mfb_');
  INSERT INTO fabric.broker_tickets (ticket_hash, login, expires_at)
  VALUES (fabric._broker_ticket_hash(v_ticket), session_user, pg_catalog.now() + p_ttl);
  RETURN v_ticket;
END $$;

-- ---------------------------------------------------------------------------------------
-- fabric_api.redeem_broker_ticket: the login a live ticket names, consuming the ticket
-- (the serve process only: fabric_projector). An unknown, used or expired ticket is one
-- refusal (42501); expired tickets are cleared on the way.
CREATE OR REPLACE FUNCTION fabric_api.redeem_broker_ticket(p_ticket text)
RETURNS name
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
  v_login name;
BEGIN
  PERFORM fabric._reset_context();
  PERFORM fabric._require_role('fabric_projector', 'redeem broker tickets');
  DELETE FROM fabric.broker_tickets t
   WHERE t.ticket_hash = fabric._broker_ticket_hash(p_ticket) AND t.expires_at > pg_catalog.now()
  RETURNING t.login INTO v_login;
  IF v_login IS NULL THEN
    PERFORM fabric._raise_rule('insufficient_privilege',
      'the broker ticket is unknown, used or expired',
      'take a new one on your own connection: SELECT fabric_api.issue_broker_ticket()');
  END IF;
  DELETE FROM fabric.broker_tickets t WHERE t.expires_at <= pg_catalog.now();
  RETURN v_login;
END $$;
