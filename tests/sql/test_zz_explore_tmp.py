import psycopg, json
from psycopg.types.json import Jsonb
from conftest import Fabric, episode

def test_explore(fabric: Fabric) -> None:
    run = fabric.open_run()
    a = fabric.connect("mf_agent_a")
    for content in ({"t": "CANARY-NUL1 \x00 x"}, ):
        try:
            a.execute("SELECT fabric_api.propose(%s, %s)", (Jsonb(episode(content=content)), run))
        except psycopg.Error as e:
            print("ERR", e.sqlstate, e.diag.message_primary, "|", e.diag.message_detail, "|", e.diag.context)
    for txt in ('{"content": {"t": "CANARY-BAD1", "x": tru}}', '{"content": {"t": "CANARY-NUM", "n": 1e99999999}}'):
        try:
            a.execute("SELECT fabric_api.propose(%s::jsonb, %s)", (txt, run))
        except psycopg.Error as e:
            print("ERR", e.sqlstate, e.diag.message_primary, "|", e.diag.message_detail, "|", e.diag.context)
    su = fabric.su()
    for v in (10**30, 2**53+1, 1e23):
        try:
            print(v, su.execute("SELECT fabric.content_hash(%s::jsonb)", (json.dumps({"n": v}),)).fetchone())
        except psycopg.Error as e:
            print(v, "REFUSED", e.sqlstate)
    print(open(fabric.server.logfile).read()[-2500:])
