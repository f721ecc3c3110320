// The Node.js side of bench/peers: AWS Powertools for Lambda (TypeScript)'s
// idempotency utility, and the same AWS SDK v3 / node-redis clients doing the
// writes by hand, measured the way the Go side measures idem.
//
// The Go harness starts this process (node peers.mjs) and drives it over
// stdin/stdout, one JSON object a line: a request
//   {"lib":"powertools"|"raw","store":"dynamodb"|"redis","kind":"new"|"dup"|"cache",
//    "conc":16,"calls":2000,"keys":200,"tag":"r1-...","setup":false}
// is answered with
//   {"calls":2000,"seconds":1.2,"p50_us":..,"p99_us":..,"cpu_us":..,"requests":..}
// or {"error":"..."}. Configuration comes from the environment:
// PEERS_DYNAMODB_ENDPOINT, PEERS_REDIS_URL, PEERS_TABLE_POWERTOOLS,
// PEERS_TABLE_RAW.
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';

import { IdempotencyConfig, makeIdempotent } from '@aws-lambda-powertools/idempotency';
import { CachePersistenceLayer } from '@aws-lambda-powertools/idempotency/cache';
import { DynamoDBPersistenceLayer } from '@aws-lambda-powertools/idempotency/dynamodb';
import {
  ConditionalCheckFailedException,
  DynamoDBClient,
  PutItemCommand,
  UpdateItemCommand,
} from '@aws-sdk/client-dynamodb';
import { createClient } from '@redis/client';

const env = (name) => {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
};

// Store requests, counted on the client side: an SDK middleware for
// DynamoDB, a wrapper around the Redis client for Redis.
let requests = 0;

const dynamo = new DynamoDBClient({
  region: 'us-east-1',
  endpoint: env('PEERS_DYNAMODB_ENDPOINT'),
  credentials: { accessKeyId: 'local', secretAccessKey: 'local' },
});
dynamo.middlewareStack.add(
  (next) => async (args) => {
    requests++;
    return next(args);
  },
  { step: 'initialize', name: 'peersCountRequests' }
);

const redis = createClient({ url: env('PEERS_REDIS_URL') });
await redis.connect();
// The client Powertools' cache persistence layer calls: get, set, del.
const countingRedis = {
  get: (...a) => {
    requests++;
    return redis.get(...a);
  },
  set: (...a) => {
    requests++;
    return redis.set(...a);
  },
  del: (...a) => {
    requests++;
    return redis.del(...a);
  },
};

// Outside Lambda there is no invocation context; Powertools reads the
// remaining time from it to bound an in-progress claim (and warns on every
// call without one). This stands in for Lambda's, with 60 s left.
const lambdaContext = {
  functionName: 'peers',
  getRemainingTimeInMillis: () => 60_000,
};

const charge = async (_payload) => ({ id: 'r-1', amount: 1000 });

// One persistence layer and one idempotent function per store and cache
// setting (Powertools keeps its configuration, cache included, on the layer).
const idempotent = new Map();
const powertools = (store, cache) => {
  const name = `${store}/${cache}`;
  if (!idempotent.has(name)) {
    const persistenceStore =
      store === 'dynamodb'
        ? new DynamoDBPersistenceLayer({
            tableName: env('PEERS_TABLE_POWERTOOLS'),
            awsSdkV3Client: dynamo,
          })
        : new CachePersistenceLayer({ client: countingRedis });
    const config = new IdempotencyConfig({
      useLocalCache: cache,
      maxLocalCacheSize: 1024,
      lambdaContext,
    });
    idempotent.set(name, makeIdempotent(charge, { persistenceStore, config }));
  }
  return idempotent.get(name);
};

const result = JSON.stringify({ id: 'r-1', amount: 1000 });
const rawKey = (payload) => `raw#${createHash('md5').update(JSON.stringify(payload)).digest('hex')}`;

// The raw baselines: what a hand-written check does with the same client.
// DynamoDB: a new call is a conditional PutItem and an UpdateItem storing
// the result; a duplicate is the PutItem failing with the item returned.
// Redis: a new call is SET NX + SET; a duplicate is SET NX failing and a GET.
const rawDynamo = async (payload, kind) => {
  const id = rawKey(payload);
  const now = Math.floor(Date.now() / 1000);
  try {
    await dynamo.send(
      new PutItemCommand({
        TableName: env('PEERS_TABLE_RAW'),
        Item: {
          id: { S: id },
          status: { S: 'IN_PROGRESS' },
          expiration: { N: String(now + 3600) },
          in_progress_expiration: { N: String(Date.now() + 60_000) },
        },
        ConditionExpression: 'attribute_not_exists(id)',
        ReturnValuesOnConditionCheckFailure: 'ALL_OLD',
      })
    );
  } catch (err) {
    if (kind === 'dup' && err instanceof ConditionalCheckFailedException && err.Item) {
      return JSON.parse(err.Item.data.S);
    }
    throw err;
  }
  if (kind === 'dup') throw new Error(`raw duplicate ${id} was new`);
  await dynamo.send(
    new UpdateItemCommand({
      TableName: env('PEERS_TABLE_RAW'),
      Key: { id: { S: id } },
      UpdateExpression: 'SET #s = :s, #d = :d',
      ExpressionAttributeNames: { '#s': 'status', '#d': 'data' },
      ExpressionAttributeValues: { ':s': { S: 'COMPLETED' }, ':d': { S: result } },
    })
  );
  return JSON.parse(result);
};

const rawRedis = async (payload, kind) => {
  const key = rawKey(payload);
  requests++;
  const ok = await redis.set(key, 'IN_PROGRESS', { NX: true, EX: 3600 });
  if (ok === null) {
    if (kind !== 'dup') throw new Error(`raw new call ${key} was a duplicate`);
    requests++;
    return JSON.parse(await redis.get(key));
  }
  if (kind === 'dup') throw new Error(`raw duplicate ${key} was new`);
  requests++;
  await redis.set(key, result, { EX: 3600 });
  return JSON.parse(result);
};

const payload = (tag, i) => ({ order: `${tag}-${i}`, amount: 1000 });

const pick = (sorted, p) => sorted[Math.floor(p * (sorted.length - 1))];

async function run(req) {
  const { lib, store, kind, conc, calls, keys, tag } = req;
  let call;
  let setup;
  if (lib === 'powertools') {
    call = powertools(store, kind === 'cache');
    setup = call;
  } else if (lib === 'raw') {
    if (kind === 'cache') throw new Error('no raw baseline for the cache');
    const raw = store === 'dynamodb' ? rawDynamo : rawRedis;
    call = (p) => raw(p, kind);
    setup = (p) => raw(p, 'new');
  } else {
    throw new Error(`unknown lib ${lib}`);
  }
  // Duplicates and cache hits replay keys completed before the clock
  // starts, in a request of their own ("setup": true), so that the server's
  // statistics can be reset between the two.
  if (req.setup) {
    if (kind !== 'new') for (let i = 0; i < keys; i++) await setup(payload(tag, i));
    return { calls: 0 };
  }
  const lat = new Float64Array(calls);
  let next = 0;
  requests = 0;
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= calls) return;
      const p = payload(tag, kind === 'new' ? i : i % keys);
      const s = process.hrtime.bigint();
      const r = await call(p);
      lat[i] = Number(process.hrtime.bigint() - s) / 1000;
      if (r?.amount !== 1000) throw new Error(`call ${i}: unexpected result ${JSON.stringify(r)}`);
    }
  };
  await Promise.all(Array.from({ length: conc }, worker));
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const cpu = process.cpuUsage(cpu0);
  const reqs = requests;
  lat.sort();
  return {
    calls,
    seconds,
    p50_us: pick(lat, 0.5),
    p99_us: pick(lat, 0.99),
    cpu_us: cpu.user + cpu.system,
    requests: reqs,
  };
}

const out = (o) => process.stdout.write(`${JSON.stringify(o)}\n`);
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  try {
    out(await run(JSON.parse(line)));
  } catch (err) {
    out({ error: String(err?.stack ?? err) });
  }
}
await redis.quit();
dynamo.destroy();
