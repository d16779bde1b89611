"""`beam-train serve`: the exported model behind TensorFlow Serving's REST API
and a page where a person segments by clicking.

Modules, each importing only those on the lines below it:

  app          the Flask app, its routes and errors; start
  server       the HTTP server: waitress on --threads threads; its refusals as JSON
  config       ServeConfig: the command's options (no web framework imported)
  label_studio Label Studio's ML backend: /health, /setup, /predict, /webhook
  brush        Label Studio's brush masks: their RLE, written and read
  page         the page's endpoints: images by id, probabilities as PNG, IoU, next click
  practice     the page's practice mode: eval objects, the protocol's IoU and next
               click (where the page meets train.evaluate)
  store        Labels: the label store (SQLite) shared by processes, and its files
  exports      the labels' formats: instance PNG and COCO, in beam-prep's layouts
  versions     Versions: the model dir's exports, the newest served, watched for new ones
  model        RestModel: one loaded export, its status, metadata, predict
  rest         TF Serving's JSON predict format <-> tensors
  json_arrays  JSON whose large integer arrays are parsed by numpy; its depth capped
  rounds       Rounds: background data engine rounds after every N labels saved
  auth         Credentials: the bearer token and basic-auth user every request must send

static/ holds the page (plain HTML, JavaScript and CSS, no build step).
"""
